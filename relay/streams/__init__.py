"""RabbitMQ streams with broker-side deduplication (docs/streams.md): rstream lives only here."""
