"""The HTTP edge's request dialects: OpenAI Chat Completions (`openai_format`), the OpenAI
Responses API (`responses_api`) and Anthropic Messages (`anthropic_api`), each translated into the
one canonical chat request (`openai_format.ChatRequest`) that the decision core reads, and the
finish payloads of each into canonical messages (`canonical`). Nothing below the edge imports
this package: `rowgrove.gateway.core` never learns which dialect came in."""
