"""``infinilm serve``: an OpenAI-compatible HTTP server over the engine, and ``infinilm bench-serve``, its load client.

The framework is aiohttp, for the server and for the load client: it is asyncio-native (the engine's
process or thread hands each step's events to the event loop), its streaming responses write each
server-sent event as it is produced, it cancels a handler whose client disconnected
(``handler_cancellation``), it is well kept (aio-libs, releases every few months), and it is the one
asyncio HTTP framework installed on the project's GPU machine, where the H200 benchmark runs (starlette,
fastapi and uvicorn are not). Metrics go through `prometheus_client`.

Requests and responses are pydantic models (the library vLLM's and FastAPI's are). Modules, one idea each:
`schemas` (the request models and their validation), `responses` (the response models), `chat_template`,
`text` (detokenization and stop strings), `engine_core` (the engine's side: inputs in, one output per step),
`engine_client` (the event loop's side: admission, events, metrics), `engine_proc` (the core in a process of
its own, the default) and `engine_loop` (the core on a thread), `choices` (one choice's
pieces: text, logprobs, stop reason), `metrics`, `middleware` (access log, API key), `routes` (the HTTP
surface), `server` (the app, its socket and graceful shutdown), `bench_client`, and `commands` (the two
subcommands' arguments). Nothing here imports aiohttp or pydantic until a command runs.
"""

from __future__ import annotations
