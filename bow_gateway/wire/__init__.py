"""Pure wire code, with no library's private parts: WebSocket frames read and written. Imports the
layers below it only (core, runtime, backplanes)."""
