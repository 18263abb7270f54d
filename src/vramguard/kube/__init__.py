"""The Kubernetes adapters, one module per concern, shaped like client-go; nothing outside imports the client.

- `client`: the API client (user agent `vramguard/<version>`, timeouts) and how errors are told apart.
- `reflector`: LIST then WATCH for one kind of object, with bookmarks, resourceVersion, 410 relist, back-off.
- `pods`, `nodes`, `claims`: the sources the agent reads (`ports.PodSource`, `ports.ClaimSource`), each over
  reflectors.
- `correlator` (pure: spam filter, aggregation) and `events` (the writer: queue, pacing, retries, a typed sink).
- `eviction`, `capacity`: the two other writes.
"""
