package daemon

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// An etcd out of reach is not a TLS problem: the agent starts without
// etcd and retries, as over plain http.
func TestCheckEtcdTLSUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused from now on
	cfg := clientv3.Config{Endpoints: []string{"https://" + addr}, DialTimeout: 2 * time.Second,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12}}
	if err := CheckEtcdTLS(t.Context(), cfg); err != nil {
		t.Fatalf("etcd out of reach: %v, want nil", err)
	}
}
