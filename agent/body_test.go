package agent

import (
	"testing"

	"github.com/edgefence/edgefence/fence"
)

func TestJSONToBodyNumbers(t *testing.T) {
	b, err := JSONToBody([]byte(`{"setpoint": 22, "x": 1.5, "big": 18446744073709551615, "n": [-3]}`))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Setpoint float64 `cbor:"setpoint"`
		X        float64 `cbor:"x"`
		Big      uint64  `cbor:"big"`
		N        []int16 `cbor:"n"`
	}
	if err := fence.DecodeBody(b, &f); err != nil || f.Setpoint != 22 || f.X != 1.5 || f.Big != 1<<64-1 || f.N[0] != -3 {
		t.Fatalf("%+v %v", f, err)
	}
	if _, err := JSONToBody([]byte(`{} {}`)); err == nil {
		t.Fatal("two values accepted")
	}
}
