"""Load for the demo: real trace workloads (`workloads`) replayed over HTTP (`generator`)."""
