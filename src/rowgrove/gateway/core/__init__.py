"""The gateway's decision and rendering core, apart from the HTTP app: `decide` (root or
continuation, the rollout's index of completed calls), `render` (chat template -> prompt ids),
`preprocess` (messages as the engine's chat endpoint hands them to a template), `incremental` (the
per-template proof that a continuation can render only its window) and `window` (that window
rendered by MiniJinja). It reads the canonical conversation only; it imports no dialect."""
