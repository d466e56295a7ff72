-- Stream names no RabbitMQ stream can have are refused when written (docs/streams.md, "Stream
-- names"). The broker's stream plugin removes every CR and LF from a name when it creates the
-- stream (rabbit_stream_utils:enforce_correct_name, as rabbit_channel does for queues) but looks
-- a name up as given: a row for "orders\r" would find no stream, ever, while a stream "orders"
-- exists. And it refuses to create any name starting with "amq.". Such a row could only wait;
-- the producer gets a check violation instead, in the transaction that wrote it.
-- NOT VALID: no scan while this migration holds the table; rows written before it, if any had
-- such a name, stay and wait, counted by `relay status`.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = {stream_literal}::regclass
                     AND conname = '{name}_stream_name_servable') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (strpos(stream, chr(13)) = 0 '
                       'AND strpos(stream, chr(10)) = 0 AND left(stream, 4) <> ''amq.'') '
                       'NOT VALID', {stream_literal}, '{name}_stream_name_servable');
    END IF;
END $$;
