"""The REST API: Powertools' REST event handler over :mod:`asyncinfer.jobs.service`."""
