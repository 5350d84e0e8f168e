package eventsui_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

// The operator's view mounted under /outbox, behind the host's own
// authorization: here anyone may look, only operators may change things.
func ExampleNewHandler() {
	pool, _, err := eventstest.NewPool(context.Background()) // any pool on which outbox.Migrate has run
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var outbox events.Outbox // the tables on the search_path
	view, err := eventsui.NewHandler(pool, &eventsui.Config{
		Outbox: outbox,
		Prefix: "/outbox",
		Authorize: func(r *http.Request, a eventsui.Action) bool {
			return a == eventsui.ActionView || r.Header.Get("X-Role") == "operator" // the host's session check
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", view)
	server := httptest.NewServer(mux)
	defer server.Close()

	resp, err := http.Get(server.URL + "/outbox/")
	if err != nil {
		log.Fatal(err)
	}
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"))
	// Output: 200 text/html; charset=utf-8
}
