package images_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/edgefence/edgefence/agent/images"
)

// The child of TestKill9MidFetch gets an image into the cache in
// killDirEnv from killURLEnv; the parent kills it mid-fetch.
const (
	killDirEnv  = "EDGEFENCE_IMAGES_KILL_DIR"
	killURLEnv  = "EDGEFENCE_IMAGES_KILL_URL"
	killSHAEnv  = "EDGEFENCE_IMAGES_KILL_SHA256"
	killSizeEnv = "EDGEFENCE_IMAGES_KILL_SIZE"
)

func killChild() int {
	sum, _ := hex.DecodeString(os.Getenv(killSHAEnv))
	size, _ := strconv.ParseUint(os.Getenv(killSizeEnv), 10, 64)
	c, err := images.Open(os.Getenv(killDirEnv), images.Options{})
	if err == nil {
		_, err = c.Get(context.Background(), images.Ref{SHA256: sum, Size: size, URL: os.Getenv(killURLEnv)})
	}
	fmt.Println("child:", err) // not reached: killed mid-fetch
	return 1
}

func TestKill9MidFetch(t *testing.T) {
	b := newBlob(4<<20, 40)
	s := newServer(t, b, false)
	s.mode.Store(stall)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir, killURLEnv+"="+s.url(),
		killSHAEnv+"="+hex.EncodeToString(b.sum), killSizeEnv+"="+strconv.Itoa(len(b.data)))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	<-s.started
	waitFor(t, "the child's temporary file to hold half the image", func() bool { return tempBytes(dir) >= int64(len(b.data)/2) })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if e := entries(t, dir); len(e) != 0 {
		t.Fatalf("a killed fetch left an entry: %q", e)
	}
	if len(leftovers(t, dir)) == 0 {
		t.Fatal("no temporary file: the child was not killed mid-fetch")
	}
	s.mode.Store(full)
	c, lb, _ := open(t, dir, images.Options{HTTP: client(t, nil)})
	if l := leftovers(t, dir); len(l) != 0 {
		t.Fatalf("Open left %q", l)
	}
	mustGet(t, c, b, b.ref(s.url())).Close()
	t.Logf("open after the kill logged:\n%s", lb)
}
