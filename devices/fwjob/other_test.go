package fwjob_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/edgefence/edgefence/devices/fwjob"
	"github.com/edgefence/edgefence/fence"
)

// app is the device's application beside its firmware (Config.Other): it
// takes kind "app.set" and counts it in its own bucket.
type app struct{}

func (app) Check(env *fence.Envelope) error {
	if env.Kind != "app.set" {
		return errors.New("app: unknown kind " + env.Kind)
	}
	return nil
}

func (app) Apply(*fence.Envelope) error { return errors.New("app: transactions only") }

func (app) ApplyTx(tx *bbolt.Tx, env *fence.Envelope) error {
	b, err := tx.CreateBucketIfNotExists([]byte("app"))
	if err != nil {
		return err
	}
	return b.Put([]byte("last"), []byte(env.ID))
}

// TestOtherKinds: with Config.Other the device's application takes the
// commands that are not firmware steps, behind the same fence point (its
// effect committed with the mark); without it they are refused as an
// unknown kind. Firmware steps still go to the job.
func TestOtherKinds(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{})
	r.refused("app.set", nil, `unknown kind "app.set"`)

	r.cfg.Other = app{}
	r.reboot()
	if o := r.send("app.set", nil); o.Ack.Verdict != fence.Accepted || o.Reboot || o.Status.State != fwjob.Idle {
		t.Fatalf("app.set with Other: %+v", o)
	}
	var last []byte
	if err := r.s.View(func(tx *bbolt.Tx) error {
		last = bytes.Clone(tx.Bucket([]byte("app")).Get([]byte("last")))
		return nil
	}); err != nil || string(last) != "c-10-2" {
		t.Fatalf("app's effect %q %v", last, err)
	}
	r.refused("app.other", nil, "app: unknown kind app.other")
	im := newImage("j1", 300, 1, 100)
	if st := r.must(fwjob.KindBegin, im.begin()); st.State != fwjob.Downloading {
		t.Fatalf("fw.begin with Other: %+v", st)
	}
}

// TestRunningImage: the report's image is the hash of the slot the device
// runs, as the boot loader holds it: the factory image, the trial's while
// it runs, none once a cancel disarmed the running trial.
func TestRunningImage(t *testing.T) {
	r := newRig(t, fwjob.BootConfig{})
	factory := sha256Hex([]byte("factory"))
	if got := r.status().Report()["image"]; got != factory {
		t.Fatalf("factory image %v, want %s", got, factory)
	}
	im := newImage("j1", 300, 1, 100)
	r.must(fwjob.KindBegin, im.begin())
	r.download(im)
	r.must(fwjob.KindInstall, im.job1())
	r.must(fwjob.KindActivate, im.job1())
	if got := r.status().Report()["image"]; got != factory {
		t.Fatalf("before the reboot %v, want the factory's", got)
	}
	r.reboot()
	if got := r.status().Report()["image"]; got != sha256Hex(im.data) {
		t.Fatalf("trial image %v, want %s", got, sha256Hex(im.data))
	}
	r.must(fwjob.KindCancel, im.job1())
	if got := r.status().Report()["image"]; got != "" {
		t.Fatalf("after the cancel of the running trial %v, want none", got)
	}
	r.reboot()
	if got := r.status().Report()["image"]; got != factory {
		t.Fatalf("after the roll back %v, want the factory's", got)
	}
}

func sha256Hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
