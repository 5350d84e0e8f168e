package notifylimit

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	var l Limiter
	if !l.Allow(time.Hour) {
		t.Fatal("the first caller must pass")
	}
	if l.Allow(time.Hour) {
		t.Fatal("a second caller within the interval must not")
	}
	if !l.Allow(0) {
		t.Fatal("interval 0 always passes")
	}
	if l.Allow(-1) {
		t.Fatal("a negative interval never passes")
	}
	var m Limiter
	m.Allow(time.Millisecond)
	deadline := time.Now().Add(time.Second)
	for !m.Allow(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never passed again after the interval")
		}
	}
}

// Of many concurrent callers within one interval, exactly one passes.
func TestOnePassPerInterval(t *testing.T) {
	var l Limiter
	var passed atomic.Int32
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.Allow(time.Hour) {
				passed.Add(1)
			}
		}()
	}
	wg.Wait()
	if passed.Load() != 1 {
		t.Fatalf("%d callers passed, want 1", passed.Load())
	}
	a1, a2, b := For("a"), For("a"), For("b")
	if a1 != a2 || a1 == b {
		t.Fatal("one limiter per key")
	}
}

func TestRefusedWithin(t *testing.T) {
	var l Limiter
	if l.RefusedWithin(time.Hour) {
		t.Fatal("nobody was refused yet")
	}
	l.Allow(time.Hour)
	if l.RefusedWithin(time.Hour) {
		t.Fatal("the first caller passed")
	}
	l.Allow(time.Hour)
	if !l.RefusedWithin(time.Hour) {
		t.Fatal("the second caller was refused")
	}
	var never Limiter
	never.Allow(-1)
	if !never.RefusedWithin(time.Hour) {
		t.Fatal("a negative interval refuses")
	}
	deadline := time.Now().Add(time.Second)
	for never.RefusedWithin(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a refusal never grew older than a millisecond")
		}
	}
}
