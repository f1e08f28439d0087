"""The capture gateway: an OpenAI-compatible HTTP service that decides, for every call, whether it
continues an earlier call of the same rollout or starts a new root, builds the prompt from the
parent's exact tokens, asks the engine, and records the call in the ledger.

    render.py   chat template -> prompt ids; the new part of a continuation, checked
    decide.py   chain hashes, parent lookup, root or continuation (pure, per rollout)
    app.py      the HTTP routes (Starlette) over an engine and a ledger
    openai_format.py  Chat Completions: the request model, the completion and its stream
    responses_api.py  the OpenAI Responses API, translated to and from the chat conversation
    anthropic_api.py  the Anthropic Messages API, likewise, and Anthropic's error shape
    canonical.py      the seam that names the dialects (a finish body's `format`)
    validation.py     what the dialects' pydantic request models share

Nothing heavy is imported here: import the submodule you need.
"""
