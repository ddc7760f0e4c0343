"""Measure a submission the way the SOAR platform does (SALA.md §2), against any running SGLang server.

- `scoring`: the correctness rules of eval_model.py (final answer, mcq patterns, per-task scores, accuracies, C).
- `evaluate`: `soarpack eval`, one chat-completions request per row, resumable, per-row JSON.
- `speed`: `soarpack bench`, bench_serving's `/generate` streaming run for S1, S8 and Smax.
- `speedset`: `soarpack speedset`, rows that follow the published input/output length mix.
- `competition`: `soarpack score`, (0.4·S1 + 0.3·S8 + 0.3·Smax) × C.
- `client`, `jsonl`, `tokenizer`, `stats`, `render`: the HTTP requests, data files, token counts, percentiles, tables.
"""
