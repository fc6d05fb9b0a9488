"""What a model calls: graphcache manifest's tracer (``graphcache.models.trace``).

The modules are imported by their full names; this package imports nothing,
so the offline config reader (graphcache.models.config) never pulls in torch.
"""
