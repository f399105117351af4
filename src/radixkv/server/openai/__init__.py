"""The OpenAI completions and chat path: request bodies and their checks, prompts,
sampling fields, the generation handlers and logprobs (`apis/` translates the Responses
and Messages APIs onto it)."""
