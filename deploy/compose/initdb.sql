-- Demo logins (run once by the postgres image at first start). The group roles get their
-- grants from `relay migrate --roles`; creating them here lets the logins join them now.
CREATE ROLE outbox_producer NOLOGIN;
CREATE ROLE outbox_relay NOLOGIN;
CREATE ROLE outbox_spark_writer NOLOGIN;
CREATE ROLE app LOGIN PASSWORD 'app-demo' IN ROLE outbox_producer;
CREATE ROLE relay LOGIN PASSWORD 'relay-demo' IN ROLE outbox_relay;
CREATE ROLE spark_job LOGIN PASSWORD 'spark-demo' IN ROLE outbox_spark_writer;
