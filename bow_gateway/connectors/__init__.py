"""The bundled connectors (contract section 20): destinations of the webhook engine that reach
listeners another way than a socket. :mod:`.webpush`: encrypted Web Push to their browsers."""
