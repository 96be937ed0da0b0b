// Whether an address is loopback, parsed the one way every prl listener and client reads it:
// 127.0.0.0/8, ::1 and "localhost" are loopback; every other name is not, whatever it resolves
// to, and a host is never judged by its spelling ("127.evil.example" is a name, not 127/8).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prl {

// host: an IPv4 or IPv6 literal (an IPv6 one may be in brackets) or a name.
bool IsLoopbackHost(absl::string_view host);

// endpoint: "host:port", "[v6]:port", a bare IPv6 literal, or a gRPC target with a scheme
// ("dns:///host:port", "ipv4:host:port", "ipv6:[v6]:port"; "unix:" and "unix-abstract:"
// sockets are local, hence loopback).
bool IsLoopbackEndpoint(absl::string_view endpoint);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, read and released): for the
// addresses prl run hands its children.
absl::StatusOr<int> PickFreePort();

// Whether "host:port" (a literal or a name; port > 0) cannot be bound because something listens
// there (EADDRINUSE): for errors that say why a server did not start.
bool PortInUse(absl::string_view endpoint);

}  // namespace prl
