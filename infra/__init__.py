"""The asyncinfer CDK app: ``cdk.json`` runs ``infra/app.py``; the stack is in :mod:`infra.stack`
and its building blocks (keyword-only props, secure defaults) in :mod:`infra.components`."""
