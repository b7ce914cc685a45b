"""PySpark reports over benchmark records (see ``protocol_spec/bench-records.md``)."""
