"""From logits to tokens: the sampler, logit processors, n > 1 (`choices`),
grammars for structured output, stop strings."""
