"""The core: what every layer shares, the data and its rules (messages, names, criteria, the
criteria index, topics, codes, the recovery window, retention, the plugin contract, the enrichers'
pipeline). It imports no other layer of the gateway."""
