package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/riverqueue/river"

	"github.com/standmeet/events"
)

// A readiness probe: the relay's own health, and how far behind the outbox
// is, in one cheap query.
func ExampleRelay_Healthy() {
	var outbox events.Outbox // the tables on the search_path
	pool := examplePool()
	defer pool.Close()
	relay, stop := startRelay(pool, nil, events.Subscriber{Name: "audit", Types: []string{"**"},
		Map: func(context.Context, events.Event) (river.JobArgs, *river.InsertOpts, error) { return nil, nil, nil }})
	defer stop()

	ready := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := outbox.GetStats(r.Context(), pool)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case !relay.Healthy():
			http.Error(w, "relay not healthy", http.StatusServiceUnavailable)
		case st.Lag > time.Minute:
			http.Error(w, fmt.Sprintf("relays are %v behind", st.Lag), http.StatusServiceUnavailable)
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"pending": st.Pending, "poisoned": st.Poisoned})
		}
	})

	rec := httptest.NewRecorder()
	ready.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	fmt.Println(rec.Code, rec.Body.String())
	// Output: 200 {"pending":0,"poisoned":0}
}
