package sandbox

import (
	"io"
	"net"
	"testing"
	"time"
)

func TestCutProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := StartCutProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("hi")); err != nil {
			return err
		}
		b := make([]byte, 2)
		_, err = io.ReadFull(c, b)
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("an open connection survived the cut")
	}
	if err := echo(); err == nil {
		t.Fatal("a new connection went through a cut proxy")
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := echo(); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}
