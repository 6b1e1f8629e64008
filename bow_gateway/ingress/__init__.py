"""HTTP in: the inbounds (their authentication, batches, the fast path for plain JSON POSTs), the
control endpoints, the publisher that puts messages on the backplane. Imports core, runtime,
backplanes, wire and seams; never the outbound (messages reach it through the backplane)."""
