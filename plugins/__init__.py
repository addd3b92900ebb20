"""Built-in plugins: plain modules with ``@hookimpl`` functions, registered by tracker.host."""
