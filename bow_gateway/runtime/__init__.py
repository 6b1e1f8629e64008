"""Process-level services: the configuration, metrics, logs, rate limits, the Redis client
builder, the HTTP server's limits, the garbage collector's tuning, calling plugins, supervised
tasks. Imports the core only."""
