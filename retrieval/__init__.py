"""PSR retrieval: embedding spaces and encoders, FAISS top-k, the baselines and oracles, phrase search, z-score
fusion, and the LFTR head. Depends on `eval` only. Run ``python -m retrieval --help`` for the commands.
"""
