package eventsui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/standmeet/events"
)

// The chains page: ordered subscribers' subjects with jobs waiting behind a
// head (/chains; ?blocked=1 for the blocked ones only), each with its head
// job and River's state of it, and Resume (retry the head) and Skip (give
// it up, behind a confirmation page) of a blocked one.

// The chains' actions.
const (
	// ActionChainResume retries a blocked subject's head
	// (events.Outbox.ResumeChain).
	ActionChainResume Action = "chain.resume"
	// ActionChainSkip gives a blocked subject's head up
	// (events.Outbox.SkipChain).
	ActionChainSkip Action = "chain.skip"
)

func init() {
	actionText[ActionChainResume] = "resume blocked subjects"
	actionText[ActionChainSkip] = "skip the heads of blocked subjects"
}

func (h *handler) chainRoutes() {
	p := h.config.Prefix
	h.mux.HandleFunc("GET "+p+"/chains", h.chains)
	h.mux.HandleFunc("POST "+p+"/chains/resume", h.chainChange(ActionChainResume))
	h.mux.HandleFunc("GET "+p+"/chains/skip", h.confirmChainSkip)
	h.mux.HandleFunc("POST "+p+"/chains/skip", h.chainChange(ActionChainSkip))
}

func (h *handler) chains(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	params := events.ListChainsParams{Subscriber: q.Get("subscriber"), Blocked: q.Get("blocked") == "1", After: q.Get("after")}
	res, err := h.config.Outbox.ListChains(r.Context(), h.db, params)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("%s %s", invalid.Field, invalid.Reason))
		return
	}
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	next := ""
	if res.Next != "" {
		v := url.Values{"after": {res.Next}}
		if params.Blocked {
			v.Set("blocked", "1")
		}
		if params.Subscriber != "" {
			v.Set("subscriber", params.Subscriber)
		}
		next = h.config.Prefix + "/chains?" + v.Encode()
	}
	p := h.page("Ordered subjects", "chains", r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "chains", struct {
		page
		Chains             []events.ChainInfo
		Blocked            bool
		Subscriber         string
		NextURL            string
		CanResume, CanSkip bool
	}{p, res.Chains, params.Blocked, params.Subscriber, next, h.may(r, ActionChainResume), h.may(r, ActionChainSkip)})
}

// chainForm reads a chain's subscriber and subject from the request (the
// form of a POST, the query of a GET).
func chainForm(w http.ResponseWriter, r *http.Request) (subscriber, subject string, ok bool) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		return "", "", false
	}
	subscriber, subject = r.Form.Get("subscriber"), r.Form.Get("subject")
	return subscriber, subject, subscriber != "" && subject != ""
}

func (h *handler) confirmChainSkip(w http.ResponseWriter, r *http.Request) {
	if !h.guard(w, r, ActionChainSkip) {
		return
	}
	subscriber, subject, ok := chainForm(w, r)
	if !ok {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "Name a subscriber and a subject.")
		return
	}
	h.render(w, http.StatusOK, "confirm", confirm{page: h.page("Skip the blocked head?", "chains", r),
		Question: fmt.Sprintf("Give up the job at the head of subject %q for subscriber %s?", subject, subscriber),
		Detail:   "Its event is never handled by that subscriber (its River job stays as River ended it); the next job of the subject runs. This cannot be undone.",
		Action:   h.config.Prefix + "/chains/skip", Button: "Skip the head", Danger: true,
		Fields: map[string]string{"subscriber": subscriber, "subject": subject},
		Cancel: h.config.Prefix + "/chains?blocked=1"})
}

// chainChange serves Resume and Skip of one blocked chain.
func (h *handler) chainChange(action Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.refuse(w, r, action) {
			return
		}
		subscriber, subject, ok := chainForm(w, r)
		if !ok {
			h.fail(w, r, http.StatusBadRequest, "Bad request", "Name a subscriber and a subject.")
			return
		}
		f, done := h.config.Outbox.ResumeChain, "resumed: its head is retried"
		if action == ActionChainSkip {
			f, done = h.config.Outbox.SkipChain, "skipped: its head is given up, the next job runs"
		}
		if err := f(r.Context(), h.db, subscriber, subject); err != nil {
			switch {
			case errors.Is(err, events.ErrUnknownChain):
				h.fail(w, r, http.StatusNotFound, "Not found", "That subscriber has no job waiting for that subject (it may have finished).")
			case errors.Is(err, events.ErrNotBlocked):
				h.fail(w, r, http.StatusConflict, "Not blocked", "Only a blocked subject can be resumed or skipped.")
			default:
				h.dbError(w, r, err)
			}
			return
		}
		msg := fmt.Sprintf("Subject %s of %s %s.", subject, subscriber, done)
		http.Redirect(w, r, h.config.Prefix+"/chains?blocked=1&done="+url.QueryEscape(msg), http.StatusSeeOther)
	}
}
