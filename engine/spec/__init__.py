"""Speculative decoding: draft proposers and the policy that decides when to draft.

A proposer guesses the next K tokens of a decoding sequence; the scheduler runs the
sequence's newest token and the K guesses as one K+1-token chunk whose every row yields
logits (engine/batch.py ``SeqChunk.num_draft``), and postprocessing (engine/postprocess.py)
samples the rows in order, exactly as plain decoding would have, keeping guesses while they
equal what was sampled. Because the GEMMs and attention are batch invariant, a row's logits
are the bits plain decoding computes for that position, so greedy (and seeded) outputs are
unchanged; only the number of steps drops.

- config.py: ``--speculative-config`` (vLLM's JSON keys);
- proposer.py: the proposer interface (a draft model can implement it later);
- ngram.py: prompt lookup (n-gram matching over the sequence's own tokens);
- policy.py: per-sequence backoff, so drafts that keep failing stop costing anything;
- decoder.py: the engine-side owner of the above, and the acceptance statistics.
"""
