"""Decoding a trained model over its key/value cache: an encoder-decoder's greedy, beam and
sampled search (encoder_decoder), and a decoder-only language model continuing text
(decoder_only, with the same samplers)."""
