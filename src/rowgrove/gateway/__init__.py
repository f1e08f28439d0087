"""The capture gateway: an OpenAI-compatible HTTP service that decides, for every call, whether it
continues an earlier call of the same rollout or starts a new root, builds the prompt from the
parent's exact tokens, asks the engine, and records the call in the ledger.

    HTTP request --> dialects/ --> canonical chat request --> sessions --> core/ --> engine, ledger
                     (the edge)                               (the call's life)  (decide, render)

    app.py, server.py, protocol.py   the HTTP routes (Starlette) and server over an engine and a ledger
    responses.py      what the routes send: JSON, the error mapping, the delivery-watched answer
    sessions.py       the life of one call: decide -> ledger pending -> engine -> ledger completed
    control.py        the control routes' work: finish, lineage, rows
    settings.py       the gateway's settings and start-up choices (parsers, context length)
    images.py         image parts: loading, pixel digests, stored images (vision models)
    metrics.py        Prometheus counters and histograms
    testing.py        a gateway on a free loopback port, for tests and examples
    dialects/         the request dialects, translated at the edge into one chat request:
      openai_format.py  Chat Completions: the request model, the completion and its stream
      responses_api.py  the OpenAI Responses API, translated to and from the chat conversation
      anthropic_api.py  the Anthropic Messages API, likewise, and Anthropic's error shape
      canonical.py      the seam that names the dialects (a finish body's `format`)
      leading.py        a leading run of system / developer messages as one turn
      validation.py     what the dialects' pydantic request models share
    core/             the decision and rendering core, which imports no dialect:
      decide.py         chain hashes, parent lookup, root or continuation (pure, per rollout)
      messages.py       what a request's messages must be; the response message
      render.py         chat template -> prompt ids; the new part of a continuation, checked
      drift.py          the string helpers of render's history-drift probe
      preprocess.py     messages as the engine's chat endpoint hands them to the template
      incremental.py    the per-template proof that a continuation renders only its window
      window.py         that window rendered by MiniJinja, in apply_chat_template's environment

Nothing heavy is imported here: import the submodule you need.
"""
