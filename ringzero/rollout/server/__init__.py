"""The engine behind SGLang's HTTP API: the app (``app``), request schema and answer format, the scheduler
thread that owns the engine and its continuous loop, control and OpenAI routes."""
