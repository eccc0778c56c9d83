"""The wire protocols a replica speaks; each turns a request into batch items and results back."""
