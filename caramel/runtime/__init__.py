"""What strategies share at run time: buckets, gradient hooks, lazy updates, buffer and tied-row
sync, communication-thread priority. The strategies compose these (`caramel.strategies`)."""
