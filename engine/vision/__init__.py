"""Image input for Ministral-3: the Pixtral vision tower and the multimodal projector
(config.py, weights.py, tower.py, projector.py, encoder.py), image preprocessing and the
prompt's image-token layout (preprocess.py, layout.py), and the encoded-image cache."""
