"""Operations: HTTP probes, metrics, logs.
"""
