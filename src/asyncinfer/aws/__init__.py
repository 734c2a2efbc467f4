"""AWS adapters: boto3 clients from the settings, S3 payloads, the deployer's preflight checks."""
