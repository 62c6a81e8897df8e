package org.sparkflow.exchange;

import java.util.Map;

/** The little JSON the launcher contract needs: a flat object of strings out, string fields back in. */
final class Json {
    private Json() {}

    static String object(Map<String, String> values) {
        StringBuilder sb = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, String> e : values.entrySet()) {
            if (!first) {
                sb.append(',');
            }
            first = false;
            string(sb, e.getKey());
            sb.append(':');
            string(sb, e.getValue());
        }
        return sb.append('}').toString();
    }

    static void string(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }

    /** The string value of a top-level field of a flat JSON object, or null. */
    static String field(String json, String name) {
        String key = "\"" + name + "\"";
        int i = json.indexOf(key);
        while (i >= 0) {
            int j = i + key.length();
            while (j < json.length() && Character.isWhitespace(json.charAt(j))) {
                j++;
            }
            if (j < json.length() && json.charAt(j) == ':') {
                j++;
                while (j < json.length() && Character.isWhitespace(json.charAt(j))) {
                    j++;
                }
                if (j < json.length() && json.charAt(j) == '"') {
                    return parseString(json, j);
                }
                int end = j;
                while (end < json.length() && ",}".indexOf(json.charAt(end)) < 0) {
                    end++;
                }
                return json.substring(j, end).trim();
            }
            i = json.indexOf(key, i + 1);
        }
        return null;
    }

    private static String parseString(String json, int start) {
        StringBuilder sb = new StringBuilder();
        for (int i = start + 1; i < json.length(); i++) {
            char c = json.charAt(i);
            if (c == '"') {
                return sb.toString();
            }
            if (c == '\\' && i + 1 < json.length()) {
                char n = json.charAt(++i);
                switch (n) {
                    case 'n': sb.append('\n'); break;
                    case 'r': sb.append('\r'); break;
                    case 't': sb.append('\t'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'u':
                        sb.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16));
                        i += 4;
                        break;
                    default: sb.append(n);
                }
            } else {
                sb.append(c);
            }
        }
        throw new IllegalArgumentException("unterminated JSON string");
    }
}
