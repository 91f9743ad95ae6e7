"""SHGAT: multi-level hypergraph attention over tools and capabilities (seed 000)."""
