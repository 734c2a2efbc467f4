"""The job layer: the job record (:mod:`.record`), its one module of transitions
(:mod:`.transitions`), the table client and queries (:mod:`.store`), the job service of the API
(:mod:`.service`), the job object (:mod:`.view`), events (:mod:`.events`), queue messages
(:mod:`.messages`), leases, idempotency keys, list cursors, inputs and wait slots."""
