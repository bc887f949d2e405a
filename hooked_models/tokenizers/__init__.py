"""Tokenizers a checkpoint carries: fixed vocabularies (`vocab`: CharTokenizer, WordTokenizer) and
the byte-level BPE of the text models (`bpe`: BPETokenizer)."""
