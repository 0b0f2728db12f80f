package sandbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// A test in another package starts the default world in a temp dir and
// points its clients at the endpoints.
func ExampleStartWorld() {
	dir, err := os.MkdirTemp("", "example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	w, err := sandbox.StartWorld(context.Background(), sandbox.WorldConfig{Dir: dir, Fast: true})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	cli, err := w.Etcd.Client()
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(context.Background(), "edgefence/hello", "world"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("etcd and broker up:", w.Etcd.Endpoint() != "", w.Broker.URL() != "")
	// Output: etcd and broker up: true true
}
