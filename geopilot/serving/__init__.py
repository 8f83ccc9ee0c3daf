"""Serving GeoPilot (docs/serving.md): an OpenAI-compatible API with images and tool traces, a FastChat worker, request
batching, an OpenAI-compatible engine as the LLM (`GeoPilot.from_endpoint`, geopilot/agent/http_engine.py), a web demo, and hardening.

    geopilot serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-batch N] [--batch-wait-ms MS]

Modules: `config` (ServeConfig), `security` (key, body and pixel limits, image URL policy), `protocol` (the request
model and message reading), `batcher` (requests into `chat_batch`), `stops` (`stop` handling), `api` (the FastAPI
app and the demo), `worker` (FastChat 0.2.36 worker protocol), `cli` (`geopilot serve` / `python serve.py`).
"""
