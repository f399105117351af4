"""How the HTTP server reaches its engine: the engine core (commands in, one batch of
outputs per step out), the engine process and its ZeroMQ link, the in-process mode, the
client the routes hold, and building the engine for `radixkv serve`."""
