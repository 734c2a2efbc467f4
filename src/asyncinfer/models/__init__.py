"""Models: their input schemas (light, imported by the API) and their handlers (heavy, imported
only by workers). See :mod:`asyncinfer.models.registry`."""
