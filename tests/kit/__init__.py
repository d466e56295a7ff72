"""The tests' shared kit: one consumer (consumer.py), one row producer (producer.py), one TCP
proxy (proxy.py), and the in-memory store, publisher and lock the unit tests drive the loop
with (fakes.py), checked against the real store by tests/integration/test_store_contract.py."""
