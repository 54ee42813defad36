"""Beam search: the search over next-token log-probabilities (search.py), driven by a
caller that asks the engine for each live beam's likeliest next tokens
(service/beam_search.py)."""

from engine.beam.search import Beam, BeamSearch, beam_score

__all__ = ["Beam", "BeamSearch", "beam_score"]
