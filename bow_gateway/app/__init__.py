"""The assembly: ``Bow`` (the server), the web application's routes, the standalone gateway
(TOML, environment, plugin tables, defaults) and its workers. Imports every layer below it."""
