package shadow_test

import (
	"fmt"

	"github.com/edgefence/edgefence/shadow"
)

func ExampleMerge() {
	reported, _ := shadow.DecodeJSON([]byte(`{"temp":19,"cfg":{"mode":"eco","fan":2},"alarms":["filter"]}`), shadow.Limits{})
	patch, _ := shadow.DecodeJSON([]byte(`{"temp":21,"cfg":{"fan":null},"alarms":[]}`), shadow.Limits{})
	out, _ := shadow.EncodeJSON(shadow.Merge(reported, patch))
	fmt.Println(string(out))
	// Output: {"alarms":[],"cfg":{"mode":"eco"},"temp":21}
}

func ExampleDelta() {
	desired, _ := shadow.DecodeJSON([]byte(`{"temp":21,"cfg":{"mode":"eco","fan":3}}`), shadow.Limits{})
	reported, _ := shadow.DecodeJSON([]byte(`{"temp":21,"cfg":{"mode":"eco","fan":2},"rssi":-60}`), shadow.Limits{})
	out, _ := shadow.EncodeJSON(shadow.Delta(desired, reported))
	fmt.Println(string(out))
	// Output: {"cfg":{"fan":3}}
}
