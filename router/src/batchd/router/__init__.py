"""batchd's router: between clients and replicas, one replica picked per request by load."""
