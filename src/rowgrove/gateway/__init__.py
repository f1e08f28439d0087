"""The capture gateway: an OpenAI-compatible HTTP service that decides, for every call, whether it
continues an earlier call of the same rollout or starts a new root, builds the prompt from the
parent's exact tokens, asks the engine, and records the call in the ledger.

    render.py   chat template -> prompt ids; the new part of a continuation, checked
    decide.py   chain hashes, parent lookup, root or continuation (pure, per rollout)
    app.py      the HTTP routes (Starlette) over an engine and a ledger

Nothing heavy is imported here: import the submodule you need.
"""
