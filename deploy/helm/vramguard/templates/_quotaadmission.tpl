{{- /*
CEL for templates/quotaadmission.yaml: the agent's reading of a quota (core/quantity.py, core/quota.py) and its
words. CEL has no functions and no let; `[x].map(name, body)[0]` binds a name, and the helpers below are pasted in
where they are used. Every string is bounded before a regular expression or a conversion reads it (a value the
agent reads is at most 64 characters, quantity.MAX_LENGTH), and every int() and substring() is guarded, so that
no pod can make an expression fail.
*/}}

{{- /* 2^p for each binary suffix's power p */}}
{{- define "vramguard.cel.pow2" -}}
{60: 1152921504606846976, 50: 1125899906842624, 40: 1099511627776, 30: 1073741824, 20: 1048576, 10: 1024}
{{- end -}}

{{- /* 10^p for each decimal suffix's power p */}}
{{- define "vramguard.cel.pow10" -}}
{18: 1000000000000000000, 15: 1000000000000000, 12: 1000000000000, 9: 1000000000, 6: 1000000, 3: 1000}
{{- end -}}

{{- /* Bytes per unit of each binary suffix, and of the letter a miswritten one starts with */}}
{{- define "vramguard.cel.binaryUnits" -}}
{'Ki': 1024, 'Mi': 1048576, 'Gi': 1073741824, 'Ti': 1099511627776, 'Pi': 1125899906842624, 'Ei': 1152921504606846976}
{{- end -}}

{{- /* Python's str.isspace() characters, as an RE2 class body */}}
{{- define "vramguard.cel.space" -}}
\t\n\x0b\x0c\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}
{{- end -}}

{{- /* text.show_value(<the CEL string expression given>): cut to 78 characters, in JSON's double quotes with
json.dumps' escapes (ensure_ascii=False), cut again to 80 where the escapes made it longer. */}}
{{- define "vramguard.cel.show" -}}
[{{ . }}]
.map(shown, size(shown) > 78 ? shown.substring(0, 78 - size('...[cut: ' + string(size(shown)) + ' characters]')) + '...[cut: ' + string(size(shown)) + ' characters]' : shown)
.map(shown, '"' + shown.replace('\\', '\\\\').replace('"', '\\"')
{{- range $i := until 32 }}
{{- $short := dict "8" "\\\\b" "9" "\\\\t" "10" "\\\\n" "12" "\\\\f" "13" "\\\\r" }}
{{- printf ".replace('\\x%02x', '%s')" $i (get $short (toString $i) | default (printf "\\\\u%04x" $i)) }}
{{- end }} + '"')
.map(shown, size(shown) > 80 ? shown.substring(0, 80 - size('...[cut: ' + string(size(shown)) + ' characters]')) + '...[cut: ' + string(size(shown)) + ' characters]' : shown)[0]
{{- end -}}

{{- /* A pod annotation as a quota field (list name unit): on UPDATE only when its value changed. */}}
{{- define "vramguard.cel.annotationField" -}}
{{- $name := index . 0 }}
{{- $unit := index . 1 -}}
('{{ $name }}' in variables.annotations
  && (!('{{ $name }}' in variables.oldAnnotations) || variables.oldAnnotations['{{ $name }}'] != variables.annotations['{{ $name }}'])
  ? [{'field': 'metadata.annotations[{{ $name }}]', 'value': string(variables.annotations['{{ $name }}']), 'name': '{{ $name }}', 'unit': '{{ $unit }}'}]
  : [])
{{- end -}}

{{- /*
One field `f` ({field, value, name, unit}) judged as `parse_quota_bytes(value, unit, name)` judges it, in its order:
{field, value (as the agent holds it), reason, bytes, says}. `reason` is the QuantityError's reason, "" for a quota;
`bytes` its bytes, exact; `says` "" (the whole text after the value, where a verdict is no QuantityError). Inside,
each verdict is [reason, bytes, unused].
*/}}
{{- define "vramguard.cel.quotaVerdict" -}}
// As the agent holds it: cut to 1024 characters (kube/pod_manifest.py).
[size(f.value) > 1024 ? f.value.substring(0, 1024 - size('...[cut: ' + string(size(f.value)) + ' characters]')) + '...[cut: ' + string(size(f.value)) + ' characters]' : f.value].map(v,
// [+-] whole [. frac] suffix, read only from a value of at most 64 characters.
[size(v) <= 64 ? v.find(r'^[+-]?[0-9]*(\.[0-9]*)?') : ''].map(num,
[num.find(r'^[+-]')].map(sign,
[num.substring(size(sign)).find(r'^[0-9]*')].map(whole,
[num.substring(size(sign) + size(whole)).find(r'[0-9]+')].map(frac,
[size(v) <= 64 ? v.substring(size(num)) : ''].map(suffix,
[whole + (frac != '' ? '.' + frac : '')].map(number,
[suffix in ['', 'k', 'M', 'G', 'T', 'P', 'E'] ? 'decimal'
  : suffix in ['Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'] ? 'binary'
  : suffix.matches(r'^[eE][+-]?[0-9]+$') ? 'exponent' : ''].map(kind,
[
  v == '' ? ['empty', '', '']
  : size(v) > 64 ? ['longer than 64 characters', '', '']
  : v.matches(r'[{{ include "vramguard.cel.space" . }}]')
  ? ['contains whitespace; write ' + {{ include "vramguard.cel.show" (printf "v.findAll(r'[^%s]+').join('')" (include "vramguard.cel.space" .)) }}, '', '']
  : whole == '' && frac == '' ? ['expected a number with an optional suffix, e.g. 12Gi, 12G, 12884901888 or 12e9', '', '']
  : kind == '' ? [
    // _suffix_hint: what the user most likely meant
    suffix == 'm' ? 'm means milli (10^-3) bytes; write ' + number + 'M (10^6) or ' + number + 'Mi (2^20)'
    : suffix == 'u' ? 'u means micro (10^-6) bytes, not a whole byte count'
    : suffix == 'n' ? 'n means nano (10^-9) bytes, not a whole byte count'
    : suffix in ['e', 'E+', 'E-', 'e+', 'e-'] ? 'an exponent needs digits, e.g. ' + number + 'e9'
    : suffix.matches(r'^[KkMmGgTtPpEe]([iI][bB]?|[bB])?$') ? (
      [suffix.substring(0, 1).upperAscii()].map(letter,
      [suffix.substring(1).lowerAscii()].map(rest,
      [letter == 'K' ? 'k' : letter].map(decimal,
      [{'k': '3', 'M': '6', 'G': '9', 'T': '12', 'P': '15', 'E': '18'}[decimal]].map(power,
      [whole.find(r'[1-9][0-9]*')].map(w,
      // the bytes, for a whole number within int64 only (quantity._whole_within_int64)
      [number + letter + 'i' + (frac.matches(r'^0*$') && size(w) <= 18
          && (w == '' ? 0 : int(w)) <= 9223372036854775807 / {{ include "vramguard.cel.binaryUnits" . }}[letter + 'i']
        ? ' or ' + string((w == '' ? 0 : int(w)) * {{ include "vramguard.cel.binaryUnits" . }}[letter + 'i']) : '')].map(spelled,
        rest == '' ? 'suffixes are case-sensitive; write ' + number + decimal + ' (10^' + power + ') or ' + number + letter
          + 'i (2^' + {'K': '10', 'M': '20', 'G': '30', 'T': '40', 'P': '50', 'E': '60'}[letter] + ')'
        : rest == 'i' ? 'suffixes are case-sensitive; write ' + spelled
        : rest == 'ib' ? suffix + ' is not a Kubernetes suffix; write ' + spelled
        : suffix + ' is not a Kubernetes suffix; write ' + spelled + ' for ' + number + ' ' + letter + 'iB, or ' + number
          + decimal + ' for ' + number + 'e' + power + ' bytes'
      )[0])[0])[0])[0])[0])[0])
    : 'unknown suffix ' + {{ include "vramguard.cel.show" "suffix" }}
      + '; Kubernetes suffixes are Ki Mi Gi Ti Pi Ei (binary), k M G T P E (decimal) and e<N> (exponent), case-sensitive',
    '', '']
  : (whole + frac).matches(r'^0*$') ? [kind == 'binary' && f.unit != '1'
    ? f.name + ' is a count of ' + {'1048576': 'MiB', '1073741824': 'GiB', '268435456': '256 MiB units'}[f.unit] + ', not a byte quantity; write 0 for ' + v
    : 'a quota must be at least 1Mi (1048576 bytes), not 0 bytes: no GPU workload fits in it', '', '']
  : sign == '-' ? ['must not be negative', '', '']
  : kind == 'binary' ? (
    // (whole.frac) × 2^power: w the whole part within 18 digits (else -1), fs the fraction less its trailing zeros
    [{{ include "vramguard.cel.binaryUnits" . }}[suffix]].map(unit,
    [whole.find(r'[1-9][0-9]*')].map(wd,
    [size(wd) > 18 ? -1 : wd == '' ? 0 : int(wd)].map(w,
    [frac.find(r'^[0-9]*[1-9]')].map(fs,
    [w >= 0 && w <= 9223372036854775807 / unit].map(fits,
      f.unit != '1' ? [f.name + ' is a count of ' + {'1048576': 'MiB', '1073741824': 'GiB', '268435456': '256 MiB units'}[f.unit] + ', not a byte quantity'
        + (fs == '' && fits && w * unit % int(f.unit) == 0 ? '; write ' + string(w * unit / int(f.unit)) + ' for ' + v : ''), '', '']
      // over the int64 maximum: the whole part, or at its limit a fraction above 1 - 2^-power
      : !fits || w == 9223372036854775807 / unit && fs != ''
          && (fs + '{{ repeat 64 "0" }}').substring(0, 64) > ({'Ki': '9990234375', 'Mi': '99999904632568359375',
            'Gi': '999999999068677425384521484375', 'Ti': '9999999999990905052982270717620849609375',
            'Pi': '99999999999999911182158029987476766109466552734375',
            'Ei': '999999999999999999132638262011596452794037759304046630859375'}[suffix] + '{{ repeat 64 "0" }}').substring(0, 64)
        ? ['larger than the int64 maximum of 9223372036854775807 bytes', '', '']
      : fs == '' ? (w * unit < 1048576
        ? ['a quota must be at least 1Mi (1048576 bytes), not ' + string(w * unit) + ' bytes: no GPU workload fits in it', '', '']
        : ['', string(w * unit), ''])
      // a fraction: rounded up to a whole byte, found exactly by comparing quantities (float only to start from;
      // past 2^52, where a float is no longer exact, from the small remainder over the float's whole part)
      : [(whole == '' ? '0' : whole) + '.' + frac + suffix].map(q, [quantity(q)].map(qq, [qq.asApproximateFloat()].map(approx,
          approx >= 4503599627370496.0
          ? [approx >= 9223372036854774784.0 ? 9223372036854774784 : int(approx)].map(k0,
              [qq.sub(quantity(string(k0)))].map(rq, [int(rq.asApproximateFloat())].map(c,
                ['', string(k0 + [c - 2, c - 1, c, c + 1, c + 2].filter(x, rq.compareTo(quantity(string(x))) <= 0)[0]), ''])[0])[0])[0]
          : [int(approx)].map(k, qq.compareTo(quantity(string(k))) <= 0 ? k
              : qq.compareTo(quantity(string(k + 1))) <= 0 ? k + 1 : k + 2).map(n, n < 1048576
            ? ['a quota must be at least 1Mi (1048576 bytes), not ' + string(n) + ' bytes: no GPU workload fits in it', '', '']
            : ['', string(n), ''])[0]
        )[0])[0])[0]
    )[0])[0])[0])[0])[0])
  : (
    // (whole.frac) × 10^e10 is ds × 10^t, ds its digits from the first to the last that is not 0; p digits before the point
    [kind == 'decimal' ? {'': 0, 'k': 3, 'M': 6, 'G': 9, 'T': 12, 'P': 15, 'E': 18}[suffix]
      : [suffix.substring(1)].map(x, [x.find(r'[1-9][0-9]*')].map(y,
          (size(y) > 4 ? 99999 : y == '' ? 0 : int(y)) * (x.startsWith('-') ? -1 : 1))[0])[0]].map(e10,
    [(whole + frac).find(r'[1-9][0-9]*')].map(d1,
    [d1.find(r'^[0-9]*[1-9]')].map(ds,
    [e10 - size(frac) + size(d1) - size(ds)].map(t,
    [size(ds) + t].map(p,
      f.unit == '1' ? (
        p > 19 || p == 19 && (t >= 0 ? ds + '{{ repeat 64 "0" }}'.substring(0, t) > '9223372036854775807'
                                     : ds.substring(0, 19) >= '9223372036854775807')
        ? ['larger than the int64 maximum of 9223372036854775807 bytes', '', '']
        // rounded up to a whole byte, as Quantity.Value() does
        : [t >= 0 ? int(ds + '{{ repeat 64 "0" }}'.substring(0, t)) : (p > 0 ? int(ds.substring(0, p)) : 0) + 1].map(n, n < 1048576
          ? ['a quota must be at least 1Mi (1048576 bytes), not ' + string(n) + ' bytes: no GPU workload fits in it', '', '']
          : ['', string(n), ''])[0])
      : t < 0 ? [f.name + ' is a count of ' + {'1048576': 'MiB', '1073741824': 'GiB', '268435456': '256 MiB units'}[f.unit] + ': must be a whole number', '', '']
      : p > 18 || int(ds + '{{ repeat 64 "0" }}'.substring(0, t)) > 9223372036854775807 / int(f.unit)
        ? ['larger than the int64 maximum of 9223372036854775807 bytes', '', '']
      : ['', string(int(ds + '{{ repeat 64 "0" }}'.substring(0, t)) * int(f.unit)), '']
    )[0])[0])[0])[0])[0])
].map(verdict, {'field': f.field, 'value': v, 'reason': verdict[0], 'bytes': verdict[1], 'says': ''})[0]
)[0])[0])[0])[0])[0])[0])[0])[0]
{{- end -}}


{{- /*
One field `f` ({field, value, name, unit, kind}) judged as the agent reads its kind: "absent" (a half of a pair not
given: field ""), "valueFrom" (an env[] entry set from elsewhere, core/quota.py _pair_quota), "digits"
(quantity.parse_mib_digits: NVIDIA's toolkit's whole MiB, with the digits to write where the value is a quantity of
whole MiB or MiB written out), else a quantity (`vramguard.cel.quotaVerdict`). The same map as quotaVerdict's.
*/}}
{{- define "vramguard.cel.fieldVerdict" -}}
f.?kind.orValue('') == 'absent' ? {'field': '', 'value': '', 'reason': '', 'bytes': '', 'says': ''}
: f.?kind.orValue('') == 'valueFrom'
? {'field': f.field, 'value': 'valueFrom', 'reason': '', 'bytes': '',
   'says': 'sets it from elsewhere (valueFrom), which vramguard does not read'}
: [{{ include "vramguard.cel.quotaVerdict" . | indent 2 | trim }}].map(qv, f.?kind.orValue('') != 'digits' ? qv : [qv.value].map(dv,
  size(dv) > 64 ? qv
  // digits alone: MiB (leading zeros allowed, as strconv.ParseUint reads them)
  : dv.matches(r'^[0-9]+$') ? [dv.find(r'[1-9][0-9]*')].map(dd,
    size(dd) > 13 || dd != '' && int(dd) > 8796093022207
    ? {'field': f.field, 'value': dv, 'reason': 'larger than the int64 maximum of 9223372036854775807 bytes', 'bytes': '', 'says': ''}
    : dd == '' ? {'field': f.field, 'value': dv, 'reason': 'a quota must be at least 1Mi (1048576 bytes), not 0 bytes: no GPU workload fits in it', 'bytes': '', 'says': ''}
    : {'field': f.field, 'value': dv, 'reason': '', 'bytes': string(int(dd) * 1048576), 'says': ''})[0]
  : {'field': f.field, 'value': dv, 'bytes': '', 'says': '',
     'reason': f.name + " is a whole number of MiB in digits alone, as NVIDIA's toolkit reads it"
       + (qv.reason == '' && int(qv.bytes) % 1048576 == 0 ? '; write ' + string(int(qv.bytes) / 1048576) + ' for ' + dv
         : dv.matches(r'^[0-9]{1,19} ?MiB$') ? '; write ' + [dv.find(r'^[0-9]+').find(r'[1-9][0-9]*')].map(dm, dm == '' ? '0' : dm)[0] + ' for ' + dv
         : '')}
)[0])[0]
{{- end -}}

{{- /*
The verdict on a request and limit pair from the verdicts `h` of its halves (request, limit; field "" for one not
given), as core/quota.py _pair_quota judges it: at most one, as the agent reports at most one error of a pair: the
request's if it is invalid, else the limit's if it is, else the request's if it is above the limit, else the hard
one (the limit, or the request alone), which alone the namespace's max_quota is held to (`capped`).
*/}}
{{- define "vramguard.cel.pairVerdict" -}}
[h[0]].map(r, [h[1]].map(l,
  r.field != '' && (r.reason != '' || r.says != '') ? {'field': r.field, 'value': r.value, 'reason': r.reason, 'bytes': '', 'says': r.says, 'capped': 'false'}
  : l.field != '' && (l.reason != '' || l.says != '') ? {'field': l.field, 'value': l.value, 'reason': l.reason, 'bytes': '', 'says': l.says, 'capped': 'false'}
  : r.field != '' && l.field != '' && int(r.bytes) > int(l.bytes)
  ? {'field': r.field, 'value': r.value, 'reason': '', 'bytes': r.bytes, 'capped': 'false',
     'says': 'is above the limit ' + l.value + ' (' + l.field + '): a request must be at most its limit'}
  : l.field != '' ? {'field': l.field, 'value': l.value, 'reason': '', 'bytes': l.bytes, 'says': '', 'capped': 'true'}
  : {'field': r.field, 'value': r.value, 'reason': '', 'bytes': r.bytes, 'says': '', 'capped': 'true'}
)[0])[0]
{{- end -}}
