"""Building blocks of the asyncinfer stack. Each takes keyword-only props and applies secure
defaults (encryption at rest, TLS-only resource policies, least-privilege grants), in the manner
of aws-solutions-constructs."""
