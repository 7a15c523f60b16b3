"""Tokenizers, one file per kind (byte-level BPE, SentencePiece, nanochat's pickle), plus pre-tokenizers."""
