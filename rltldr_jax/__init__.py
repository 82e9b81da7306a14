"""rltldr_jax: RLTL;DR (arXiv 2609.37633) in JAX/Flax.

Modules (see README "Architecture"): `settings` (every setting of a run, typed, with its default, bounds and
choices), `tokenization` (Qwen 3.5 tokenizer, attempt contexts with provenance), `losses` (GRPO + insight SFT as
(sum, count) terms), `metrics` (deconfounded Pass@k and insight metrics).
"""

__version__ = "0.1.0"
